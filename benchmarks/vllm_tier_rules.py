"""Which rule should Marconi's CPU-tier policy run by default? Measured with the vLLM-free emulation.

    .venv/bin/python benchmarks/vllm_tier_rules.py [--models nemotron-h-8b] [--traces swe-sample,...]
        [--pools 0.05x,0.1x] [--tiers 0.1x,0.25x,0.5x,1x] [--concurrency 16,64]
        [--rules adaptive,arc-tree,lru,a0.5,a0.5m,a2m] [--num-requests 120] [--workers 2] [--out results/vllm_tier_rules.jsonl]

Every point is the emulation the replay's tier records carry (``sim_*``; docs/vllm-tiers.md, "The
emulation"): vLLM 0.32's block pool, scheduler and ``OffloadingConnector`` (``vllm-align`` with
its CPU tier), fed the trace's first ``--num-requests`` requests (inputs capped at 8,192 tokens,
as the replay selects them) in the replay's closed loop (``--concurrency C``), stock vLLM (LRU) as
GPU policy. The GPU pool is a fraction of the trace's working set raised to vLLM's floor (one
request of ``max_model_len``), as the replay's ``--capacity`` is; the tier is a fraction of the
working set, in chunks as vLLM sizes it. The tier runs ``lru``, ``arc``, and Marconi's policy under
each ``--rules`` label (``vllm-align:…,tier_policy=marconi,tier_rule=``): a fixed rule's,
``arc-tree`` (the tree's dead chunks first, then ARC's order over the live chunks), or
``adaptive``, the rule chosen online over ghost tiers (the default; ``tier_chooser``), each
optionally with ``:cold_insert=0`` and/or ``:second_chance=0`` (``marconi_cold_insert``,
``marconi_second_chance``, on by default: the emulation's ``tier_cold_insert=0``, ``tier_second_chance=0``).
No clock: a load lands by the end of its step (the simulator's transfer rule).

Prints per point the token hit rate of LRU, ARC, the better of the two, and each rule's with its
margin over that better one in percentage points; the last line is one JSON object: per rule the
worst and the mean margin, where the worst was, and the points more than 0.5 pp below.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from marconi.core.model import ModelSpec  # noqa: E402
from marconi.core.registry import ConfigError  # noqa: E402
from marconi.integrations.common import bench as common  # noqa: E402
from marconi.integrations.vllm.emulate.engine import VllmAlignEngine  # noqa: E402
from marconi.integrations.vllm.emulate.scheduler import emulate_closed_loop  # noqa: E402
from marconi.integrations.vllm.emulate.tier import EmulatedTier, tier_num_chunks  # noqa: E402
from marconi.integrations.vllm.tier_settings import SWITCHES, parse_switch, parse_tier_rule  # noqa: E402
from marconi.integrations.vllm.layout import cdiv, layout_for_spec, prefill_checkpoint_alignment_for  # noqa: E402
from marconi.integrations.vllm.policy import ATTENTION  # noqa: E402
from marconi.integrations.vllm.replay.configs import VLLM_BLOCK_SIZES  # noqa: E402
from marconi.integrations.vllm.replay.run import model_dir  # noqa: E402
from marconi.pool import worker_pool  # noqa: E402
from marconi.units import parse_capacity  # noqa: E402

MAX_INPUT_LEN = 8192            # the replay's default --max-input-len
MAX_NUM_BATCHED_TOKENS = 8192   # the replay's default
MAX_NUM_SEQS = 256

_TRACES: dict[tuple[str, int], Any] = {}


def _requests(trace: str, num_requests: int) -> Any:
    key = (trace, num_requests)
    if key not in _TRACES:
        _TRACES[key] = common.select_requests(trace, max_input_len=MAX_INPUT_LEN, num_requests=num_requests).requests
    return _TRACES[key]


def _spec(model: str) -> ModelSpec:
    return ModelSpec.from_hf_config(model_dir(model) / "config.json", name=model)


def _layout(spec: ModelSpec, requests: Any, pool: str) -> Any:
    """The pool vLLM builds for ``--capacity pool``: the budget over the block bytes, raised to the
    floor vLLM starts with (one ``max_model_len`` request per group, in align mode 2 + checkpoint
    blocks per Mamba group, plus the null block)."""
    from marconi.sim import working_set_bytes

    checkpoint = prefill_checkpoint_alignment_for(spec)
    probe = layout_for_spec(spec, num_blocks=2, block_size=VLLM_BLOCK_SIZES.get(spec.name),
                            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                            prefill_checkpoint_alignment=checkpoint, retention_interval=0)
    max_model_len = max(2048, max(len(r.input_tokens) + max(1, len(r.output_tokens)) for r in requests))
    floor = 1 + sum(cdiv(max_model_len, probe.block_size) if k == ATTENTION else 2 + (checkpoint is not None)
                    for k in probe.group_kinds)
    budget = parse_capacity(pool).resolve(working_set_bytes(requests, spec))
    num_blocks = max(int(budget // probe.block_bytes), floor)
    return layout_for_spec(spec, num_blocks=num_blocks, block_size=probe.block_size, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                           prefill_checkpoint_alignment=checkpoint, retention_interval=0)


def run_point(task: tuple[str, str, int, str, str, int, str, str]) -> dict[str, Any]:
    """One arm at one point: the closed loop's token, GPU and tier hit rates."""
    model, trace, num_requests, pool, tier, concurrency, policy, rule = task
    from marconi.sim import working_set_bytes

    spec = _spec(model)
    requests = _requests(trace, num_requests)
    layout = _layout(spec, requests, pool)
    tier_bytes = parse_capacity(tier).resolve(working_set_bytes(requests, spec))
    chunks = tier_num_chunks(tier_bytes, layout.block_bytes)
    engine = VllmAlignEngine(layout, spec, eviction="lru")
    emulated = EmulatedTier(layout, chunks, policy, spec, **(rule_options(rule) if rule else {}))
    engine.attach_tier(emulated)
    t0 = time.perf_counter()
    loop = emulate_closed_loop(engine, requests, concurrency=concurrency, max_num_seqs=MAX_NUM_SEQS)
    chooser = getattr(emulated.manager.policy, "chooser", None)      # the adaptive rule's switches
    return {**(chooser.tuning_record() if chooser is not None else {}),"model": model, "trace": trace, "num_requests": len(requests), "pool": pool,
            "pool_blocks": layout.num_blocks, "tier": tier, "tier_chunks": chunks, "concurrency": concurrency,
            "policy": policy, "rule": rule, "token_hit_rate": loop.token_hit_rate,
            "gpu_hit_rate": loop.gpu_hit_rate, "tier_hit_rate": loop.tier_hit_rate, "wall_s": time.perf_counter() - t0}


def rule_options(label: str) -> dict[str, Any]:
    """A ``--rules`` label as ``EmulatedTier`` options: ``RULE`` -> ``{"rule": RULE}``,
    ``RULE:cold_insert=0:second_chance=0`` -> with those switches too. ConfigError naming
    ``--rules`` otherwise."""
    rule, *options = label.split(":")
    out: dict[str, Any] = {"rule": rule}
    parse_tier_rule(rule, f"--rules {label!r}")
    names = [name for name, _, _ in SWITCHES]
    for option in options:
        key, _, value = option.partition("=")
        if key not in names:
            raise ConfigError(f"--rules {label!r}: options are {', '.join(n + '=0/1' for n in names)}, got {option!r}")
        out[key] = parse_switch(value, f"--rules {label!r}: {key}")
    return out


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="nemotron-h-8b")
    ap.add_argument("--traces", default="swe-sample,mooncake-sample,chat-synthetic,doc-qa-synthetic")
    ap.add_argument("--pools", default="0.05x,0.1x")
    ap.add_argument("--tiers", default="0.1x,0.25x,0.5x,1x")
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--rules", default="adaptive,lru,a0.5,a0.5m,a2m",
                    help="Marconi's tier rules, comma-separated: 'adaptive' (the default, chosen online), "
                         "'arc-tree' (the tree's dead chunks, then ARC's order), or a fixed rule's label "
                         "(lru, a0.5, a0.5m, a2m, ...)")
    ap.add_argument("--num-requests", type=int, default=120)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="", help="JSONL of every arm's record (optional)")
    args = ap.parse_args(argv)
    rules = _split(args.rules)
    try:
        for r in rules:
            rule_options(r)
    except ConfigError as exc:
        ap.error(str(exc))
    arms = [("lru", ""), ("arc", "")] + [("marconi", r) for r in rules]
    points = [(m, t, args.num_requests, p, tier, int(c)) for m in _split(args.models) for t in _split(args.traces)
              for p in _split(args.pools) for tier in _split(args.tiers) for c in _split(args.concurrency)]
    tasks = [pt + arm for pt in points for arm in arms]
    t0 = time.perf_counter()
    for m, t, n, *_ in points:              # loaded once here; the forked workers inherit them
        try:
            _requests(t, n)
        except (ConfigError, FileNotFoundError) as exc:     # a name it cannot build, its data absent
            ap.error(f"--traces {t}: {exc}")
    with worker_pool(args.workers) as pool:
        results = list(pool.map(run_point, tasks, chunksize=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as fh:
            for rec in results:
                fh.write(json.dumps(rec) + "\n")
    by_point: dict[tuple, dict[str, dict[str, Any]]] = {}
    for rec in results:
        key = (rec["model"], rec["trace"], rec["pool"], rec["tier"], rec["concurrency"])
        by_point.setdefault(key, {})[f"marconi:{rec['rule']}" if rec["rule"] else rec["policy"]] = rec
    head = ["model", "trace", "pool (blocks)", "tier (chunks)", "C", "LRU", "ARC", "best"] + [f"`{r}` (pp)" for r in rules]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    margins: dict[str, list[tuple[float, str]]] = {r: [] for r in rules}
    for key, arm in by_point.items():
        lru, arc = arm["lru"]["token_hit_rate"], arm["arc"]["token_hit_rate"]
        best = max(lru, arc)
        any_rec = arm["lru"]
        cells = [key[0], key[1], f"{key[2]} ({any_rec['pool_blocks']})", f"{key[3]} ({any_rec['tier_chunks']})",
                 str(key[4]), f"{lru:.2%}", f"{arc:.2%}", f"{best:.2%}"]
        for r in rules:
            rate = arm[f"marconi:{r}"]["token_hit_rate"]
            m = 100 * (rate - best)
            margins[r].append((m, f"{key[1]} pool {key[2]} tier {key[3]} C={key[4]}"))
            cells.append(f"{rate:.2%} ({m:+.1f})")
        print("| " + " | ".join(cells) + " |")
    summary = {"points": len(by_point), "wall_s": round(time.perf_counter() - t0, 1),
               "rules": {r: {"worst_pp": round(min(ms)[0], 2), "worst_at": min(ms)[1],
                             "mean_pp": round(float(np.mean([m for m, _ in ms])), 2),
                             "losses_over_0.5pp": sum(m < -0.5 for m, _ in ms)} for r, ms in margins.items()}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
