"""Why our numbers differ from the paper's: a sentence per figure, chosen by what the records show.

Every number quoted here is read from the figures' computed data; the wording branches on the
sign of what was measured, so a rerun with other data cannot print a stale claim.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from marconi.experiments.repro_figures import pct, pts, signed_pct, times

__all__ = ["TRACE_NOTES", "CAPACITY_NOTES", "explain"]

TRACE_NOTES = """\
How our traces differ from the paper's (all built by the paper's recipe, `../shared/data/README.md`):

- **Tokenizer**: Mistral-7B v0.1 (32k SentencePiece-BPE, a Llama-2 look-alike) instead of Llama-2's; each message is
  tokenized on its own as `json.dumps(message)` with BOS, as the paper did (`--tokenizer llama2` uses the paper's).
- **LMSys**: LMSys-Chat-1M cannot be redistributed; ShareGPT (first sessions with ≥ 20 messages, in file order) stands in
  for it, and LMSys rows appear only when `--lmsys FILE` is given.
- **SWE**: mini-swe-agent v1.15 trajectories of gemini-3-pro on SWE-bench Verified (the paper: SWE-agent runs), first
  sessions by name, keep the last 5 observations, Poisson gaps of mean 7.5 s, 32k-token / 50-call caps. Their inputs are
  long (see the table) and every session runs many calls, so most turns are past the 6th, where the keep-5 recipe starts
  dropping observations. We also build the **keep-all** variant of the same trajectories.
- **Mooncake** (not in the paper): Kimi's production trace rebuilt at 512-token block granularity: no sessions, prefix
  sharing only at block boundaries.
- **Timing variants** (fig. 8, 13) are derived from the base traces without re-tokenizing: session *k* starts at
  *k* / rate; SWE gaps are the builder's own Poisson draws for each seed and mean (checked equal to rebuilding).
"""

CAPACITY_NOTES = """\
The paper swept 60–140 GB with its 7B model but gives no working sets for its traces. Ours differ by more than an order of
magnitude between workloads (table above), so one GB figure would be a different regime on each. Every capacity here is a
fraction of the trace's **working set** (`working_set_bytes`: what an unbounded cache with Marconi's admission holds at
the end), and the paper's regimes are placed by **contention** = SGLang+'s token hit rate at that capacity ÷ its hit rate
with an unbounded cache: *high* ≈ 0.25 stands for the paper's 60 GB, *moderate* ≈ 0.5 for the middle of its sweep (where
its gain peaked), *low* ≈ 0.85 for its 140 GB. Timing variants use their base trace's working set (same bytes across arrival
rates and seeds); fig. 12's models each use their own working set, so contention stays comparable as the state grows.
"""


def _get(data: Mapping[str, Any], *path: Any, default: Any = None) -> Any:
    cur: Any = data
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return default
        cur = cur[p]
    return cur


def _oracle_gain(reports: Mapping[str, Any], key: str) -> tuple[float | None, float | None]:
    d = _get(reports["alpha"].data, key)
    if not d or not d.get("lru_hit"):
        return None, None
    return d["oracle_hit"] / d["lru_hit"] - 1, d["oracle_alpha"]


def _tuned_share_high(reports: Mapping[str, Any]) -> float | None:
    alphas = _get(reports["anatomy"].data, "tuned_alpha_distribution", "alphas", default=[])
    return float(np.mean([a >= 1 for a in alphas])) if alphas else None


def explain(key: str, ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    fn = _EXPLAIN.get(key)
    return fn(ctx, rep, reports) if fn else ""


def _fig7(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    d = rep.data
    if not d:
        return ""
    vllm = [v["hit_rate"]["vllm+"] for v in d.values()]
    parts = [f"vLLM+ is nearly useless on our traces too ({pct(min(vllm))}–{pct(max(vllm))} token hit rate: a "
             f"{ctx.model.ssm_checkpoint_bytes / 1e6:.0f} MB checkpoint every 32 tokens floods the cache), so each multiple "
             "is essentially Marconi's absolute hit rate over a near-zero denominator and moves with the capacity"]
    swe = d.get("swe")
    if swe:
        by = swe["marconi_vs_vllm_x_by_regime"]
        parts.append(f"on keep-5 SWE it spans {times(by.get('high'))} at high contention to {times(by.get('low'))} at "
                     "low, and the paper does not say where its 34.4× sat")
        if swe["hit_rate"]["marconi"] < swe["hit_rate"]["sglang+"]:
            sg = swe["hit_rate"]["sglang+"] / max(swe["hit_rate"]["vllm+"], 1e-12)
            parts.append(f"there Marconi's bootstrap-tuned α even loses to LRU (SGLang+ alone is {times(sg)} vLLM+; "
                         "see fig. 8 and the Anatomy section)")
    return "; ".join(parts) + "."


def _fig8(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    g5, a5 = _oracle_gain(reports, "swe")
    ga, aa = _oracle_gain(reports, "swe-keepall")
    share = _tuned_share_high(reports)
    swe = rep.data.get("swe")
    if not swe:
        return ""
    by = swe["by_regime"]
    text = [f"The paper's SWE gains are not reproduced (P95 {signed_pct(swe['p95'])}, median {signed_pct(swe['median'])}); "
            "by contention the SWE medians are " + " / ".join(f"{signed_pct(v)} ({k})" for k, v in by.items())
            + f". The bootstrap tuner picks α ≥ 1 in {pct(share, 0)} of all runs; where it does, the large α keeps long "
              "dead sequences after its window (Anatomy section), and where nothing is evicted before the trace drains "
              "it never tunes and Marconi tracks LRU"]
    if g5 is not None:
        text.append(f"even the best fixed α chosen on the whole trace (an oracle) gains only {signed_pct(g5)} (α={a5:g}) "
                    "over LRU on keep-5 SWE" + (f" and {signed_pct(ga)} (α={aa:g}) on keep-all SWE" if ga is not None
                                                  else "") + " at moderate contention — the ceiling of FLOP-aware "
                    "eviction on these traces, far below +219.7%")
    return "; ".join(text) + "."


def _fig9(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    lat = _get(rep.data, "Jamba table") or next(iter(rep.data.values()), {})
    swe = lat.get("swe") if isinstance(lat, Mapping) else None
    if not swe:
        return ""
    near = 0.5 <= swe["up_to_vs_vanilla"] / 0.468 <= 2.0
    return (f"The best P95 reductions relative to vanilla follow the hit rates and "
            f"{'land near' if near else 'differ from'} the paper's percentages ({pct(swe['up_to_vs_vanilla'])} on SWE vs "
            f"46.8%), but the absolute savings are far smaller ({swe['up_to_vs_vanilla_ms']:.0f} ms at most on SWE with the "
            "Jamba table vs the paper's 617 ms): the line fitted to the authors' own Jamba measurements gives only "
            "~173 ms for a 32k-token prefill, so the paper's milliseconds cannot come from that table alone. Marconi's "
            f"extra reduction over SGLang+ (up to {pct(swe['up_to_vs_sglang'])}, median {signed_pct(swe['median_vs_sglang'])} "
            "of vanilla P95 on SWE) is small because its tuned α rarely beats LRU there (fig. 8).")


def _fig10(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    d = rep.data.get("swe")
    if not d:
        return ""
    agg, oracle = d["aggregate"], d.get("oracle")
    if (agg["long"] or 0) < 0:
        text = (f"With the bootstrap-tuned α the long inputs are the ones that lose ({pts(agg['long'])} at ≥ 7K vs "
                f"{pts(agg['short'])} below): on keep-5 SWE a long input is a late turn whose reusable part ends at the "
                "observation the recipe dropped, so protecting the longest (highest FLOP-efficiency) sequences keeps their "
                "dead suffixes, not what the next turn reuses")
    else:
        text = (f"Long inputs gain ({pts(agg['long'])} at ≥ 7K vs {pts(agg['short'])} below) as in the paper; the "
                "sizes differ with the tuned α and the capacity")
    if oracle:
        text += (f"; with the whole-trace best fixed α ({oracle['system']}) the split is {pts(oracle['short'])} / "
                 f"{pts(oracle['long'])}")
    rel = d["ttft_marconi_vs_sglang"]
    return text + (f". The TTFT quantiles follow the hit rates (P50 {signed_pct(rel['p50'])}, P95 "
                   f"{signed_pct(rel['p95'])} under the {d['ttft_model']}).")


def _fig11(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    d = rep.data.get("swe")
    if not d:
        return ""
    neg = [p for p in d["points"] if p["gain"] < 0]
    hi_alpha = [p for p in neg if p["tuned_alpha"] and max(p["tuned_alpha"]) >= 1]
    untuned = [p for p in d["points"] if not p["tuned_alpha"]]
    flat = [p for p in untuned if abs(p["gain"]) < 0.01]
    return (f"Our curve follows which α the bootstrap window picks at each size more than contention: "
            f"{len(neg)}/{len(d['points'])} capacities lose to LRU on keep-5 SWE, {len(hi_alpha)} of them with a tuned "
            f"α ≥ 1; {len(untuned)} capacities never tune (nothing evicted early enough for a window to finish), "
            f"{len(flat)} of which are within 1% of LRU. The paper's 60–140 GB is a 2.3× range; our ladder spans "
            f"{d['points'][0]['fraction']:g}x–{d['points'][-1]['fraction']:g}x and on keep-5 SWE its high/low regimes sit at "
            f"{d['high_fraction']:g}x / {d['low_fraction']:g}x.")


def _fig12(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    mixes, dims = rep.data.get("mixes", []), rep.data.get("state_dims", [])
    if not mixes and not dims:
        return ""
    text = ("The gain over vLLM+ grows with the SSM share and the state size for the paper's reason — vLLM+ stores a "
            "full SSM checkpoint per 32-token block, so its waste scales with the state bytes. Absolute multiples are not "
            "comparable: the paper's own fig. 12a and 12b disagree by an order of magnitude for nearly the same model "
            "(2.6× at 1:8 vs 35.4× at N=128) because each is normalized differently, and we size every model's cache as "
            "the same fraction of its own working set (constant contention)")
    eight = next((m for m in mixes if m["mix"] == "1:8"), None)
    if eight and dims:
        text += f"; ours are {times(eight['vs_vllm_x'])} at 1:8 and {times(dims[-1]['vs_vllm_x'])} at N={dims[-1]['dim']}"
    neg = [m for m in mixes if m["ssm"] and m["vs_sglang"] < 0]
    if neg:
        text += (f". The gain over SGLang+ is negative for {', '.join(m['mix'] for m in neg)}: it follows the α each "
                 "run's window picked (listed in the table) as in fig. 8 more than the layer mix")
    pure = next((m for m in mixes if not m["ssm"]), None)
    if pure:
        text += (f"; for the pure transformer the three systems agree within {pct(pure['spread'])} (vLLM+ differs only "
                 "by 32-token block matching)")
    return text + "."


def _fig13(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    a = rep.data.get("swe:sessions_per_second")
    if not a:
        return ""
    falls = a[-1]["marconi"] < a[0]["marconi"]
    return (f"The absolute hit rate {'falls' if falls else 'does not fall'} with load ({pct(a[0]['marconi'])} → "
            f"{pct(a[-1]['marconi'])} on SWE){' as in the paper: more sessions share the same bytes' if falls else ''}; "
            f"the relative number (Marconi over SGLang+) {'grows' if a[-1]['relative'] > a[0]['relative'] else 'shrinks'} "
            f"({times(a[0]['relative'])} → {times(a[-1]['relative'])}) while the mean tuned α moves "
            f"{a[0]['tuned_alpha_mean']:.2f} → {a[-1]['tuned_alpha_mean']:.2f}: under more load the first eviction comes "
            "earlier, a window finishes, and the large α it picks costs hits (fig. 8); our steps are larger than the "
            "paper's because our SWE sessions are long-lived (many calls each), so a faster arrival rate piles up more of "
            "them at once.")


def _alpha(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    never = [(k, m, t) for k, d in rep.data.items() for m, t in d.get("tuned", {}).items() if not t["alphas"]]
    text = ("Not in the paper. A tuned run is α=0 until its window completes, so it equals the fixed α=0 run before "
            "that point")
    if never:
        better = sum(1 for k, m, t in never if t["hit"] >= rep.data[k]["tuned"].get(5, t)["hit"])
        text += (f"; {len(never)} run(s) never finished their window before the trace ended (a 15× window needs 16× the "
                 f"requests seen before the first eviction) and so stayed at α=0, which did at least as well as the "
                 f"m=5 run in {better} of them")
    return text + "."


def _admission(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    text = ["Not in the paper. The flop-aware column uses the bootstrap-tuned α"]
    swe = _get(rep.data, "swe", "hit_rate")
    if swe and "marconi" in swe and "last-token" in swe:
        text.append(f"on keep-5 SWE last-token admission alone gets {pct(swe['last-token'].get('lru'))} against "
                    f"{pct(swe['marconi'].get('lru'))} for Marconi's (last token + branch points) under LRU: the "
                    "last-token checkpoints die when the next turn drops an observation (Anatomy), so the branch "
                    "checkpoints carry the reuse, and admissions that checkpoint inside inputs (uniform, sparse-dp) "
                    f"do as well ({pct(swe.get('uniform', {}).get('lru'))}, {pct(swe.get('sparse-dp', {}).get('lru'))})")
    return "; ".join(text) + "."


def _anatomy(ctx: Any, rep: Any, reports: Mapping[str, Any]) -> str:
    windows = rep.data.get("windows") or []
    lead = next((w for w in windows if w["trace"] == "swe"), None)
    parts = []
    if lead and lead["replay_margin"] is not None and lead["whole_margin"] is not None:
        parts.append(
            f"On keep-5 SWE the tuner's window (requests {lead['window'][0]}–{lead['window'][1]}) scores α={lead['alpha']:g} "
            f"{pts(lead['replay_margin'])} against α=0 — the lead's example — while the same α fixed over the whole "
            f"trace ends {pts(lead['whole_margin'])} against α=0. The window is not only noisy, it is unrepresentative: during it "
            f"{lead['active_window']:.0f} sessions are active on average, after it {lead['active_after']:.0f}, and "
            f"{pct(lead['late_after'], 0)} of the later turns are past the 6th, where every turn diverges from the cached "
            "one at a dropped observation and leaves a long dead suffix that a large α protects")
    for w in windows:
        if (w["replay_margin"] or 0) > 0 and (w["after_margin"] or 0) < 0 and w is not lead:
            fixed = w["after_fixed_margin"]
            parts.append(f"in {w['trace']}, α={w['alpha']:g} wins its window ({pts(w['replay_margin'])}) and "
                         f"{'wins' if (w['whole_margin'] or 0) > 0 else 'loses'} over the whole trace "
                         f"({pts(w['whole_margin'])}), but after the window the tuned run is at {pts(w['after_margin'])}"
                         + (f" and the same α fixed from the start at {pts(fixed)} over those requests — the "
                            "phase, not the switch, is what costs" if fixed is not None and fixed < 0 else ""))
    return "; ".join(parts) + ("." if parts else "")


_EXPLAIN = {"fig7": _fig7, "fig8": _fig8, "fig9": _fig9, "fig10": _fig10, "fig11": _fig11, "fig12": _fig12,
            "fig13": _fig13, "alpha": _alpha, "admission": _admission, "anatomy": _anatomy}
