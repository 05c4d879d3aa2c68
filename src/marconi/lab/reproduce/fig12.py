"""Fig. 12: the gain as the model changes: attention:SSM layer mix and SSM state dimension (SWE keep-5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from marconi.lab.reproduce.context import ReproContext
from marconi.lab.reproduce.figure import (PAPER, FigureRecords, Finding, fmt_alphas, safe_ratio,
                                                  strip_per_request, trio)
from marconi.report import MISSING, fmt_pct, fmt_signed_pct, fmt_times, md_table, pyplot, save_figure

KEY = "fig12"
TITLE = "Fig. 12 — gain vs attention:SSM ratio and SSM state dimension (SWE keep-5)"


def compute(ctx: ReproContext) -> FigureRecords:
    """The trio on keep-5 SWE at moderate contention for every layer mix and state dimension of the profile."""
    recs = FigureRecords(KEY)
    if "swe" not in ctx.traces:
        return recs
    cap = ctx.regime_capacity("swe", "moderate")
    mixes, dims = [], []
    for attn, ssm in ctx.profile.layer_mixes:
        t = trio(ctx, "swe", cap, f"{ctx.model.name}[attn={attn},ssm={ssm}]")
        if t is None:
            continue
        recs.rows += [strip_per_request(r) for r in t.values()]
        hit = {s: r["token_hit_rate"] for s, r in t.items()}
        mixes.append({"mix": f"1:{ssm // attn}" if ssm and ssm % attn == 0 else f"{attn}:{ssm}", "attn": attn, "ssm": ssm,
                      "hit": hit, "vs_vllm_x": safe_ratio(hit["marconi"], hit["vllm+"]),
                      "tuned_alpha": [a for _, a in t["marconi"]["tuned_alphas"]],
                      "vs_sglang": safe_ratio(hit["marconi"], hit["sglang+"]) - 1,
                      "spread": (max(hit.values()) - min(hit.values())) / max(max(hit.values()), 1e-12)})
    for dim in ctx.profile.state_dims:
        name = ctx.model.name if dim == ctx.model.ssm_state_dim else f"{ctx.model.name}[N={dim}]"
        t = trio(ctx, "swe", cap, name)
        if t is None:
            continue
        recs.rows += [strip_per_request(r) for r in t.values()]
        hit = {s: r["token_hit_rate"] for s, r in t.items()}
        dims.append({"dim": dim, "hit": hit, "vs_vllm_x": safe_ratio(hit["marconi"], hit["vllm+"]),
                     "tuned_alpha": [a for _, a in t["marconi"]["tuned_alphas"]],
                     "vs_sglang_x": safe_ratio(hit["marconi"], hit["sglang+"])})
    recs.data = {"capacity": cap, "mixes": mixes, "state_dims": dims}
    return recs


def plot(records: FigureRecords, out_dir: Path) -> list[Path]:
    mixes, dims = records.data.get("mixes", []), records.data.get("state_dims", [])
    if not mixes and not dims:
        return []
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    if mixes:
        a1.bar(range(len(mixes)), [m["vs_vllm_x"] for m in mixes], label="vs vLLM+ (×)")
        a1.plot(range(len(mixes)), [1 + m["vs_sglang"] for m in mixes], "ko-", label="vs SGLang+ (×)")
        a1.set_xticks(range(len(mixes)), [m["mix"] if m["ssm"] else "transformer" for m in mixes])
        a1.set_ylabel("Marconi hit rate ratio")
        a1.set_yscale("log")
        a1.legend(fontsize=7)
    if dims:
        a2.plot([d["dim"] for d in dims], [d["vs_vllm_x"] for d in dims], "o-", label="vs vLLM+")
        a2.plot([d["dim"] for d in dims], [d["vs_sglang_x"] for d in dims], "s-", label="vs SGLang+")
        a2.set_xscale("log", base=2)
        a2.set_xlabel("SSM state dimension N")
        a2.set_ylabel("Marconi hit rate ratio (×)")
        a2.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / "fig12_layers_state_dim.png")]


def section(records: FigureRecords) -> str:
    if not records.data:
        return ""
    mixes, dims = records.data["mixes"], records.data["state_dims"]
    pa, ps = PAPER["fig12a_vllm"], PAPER["fig12a_sglang"]
    body = md_table(["attention:SSM", "vLLM+", "SGLang+", "Marconi (tuned α)", "vs vLLM+", "vs SGLang+", "paper"],
                    [[m["mix"] if m["ssm"] else "0:36 (transformer)", fmt_pct(m["hit"]["vllm+"]),
                      fmt_pct(m["hit"]["sglang+"]), f"{fmt_pct(m['hit']['marconi'])} ({fmt_alphas(m['tuned_alpha'])})",
                      fmt_times(m["vs_vllm_x"]), fmt_signed_pct(m["vs_sglang"]),
                      f"{fmt_times(pa[m['mix']])} / {fmt_signed_pct(ps[m['mix']])}" if m["mix"] in pa else
                      ("all equal" if not m["ssm"] else MISSING)] for m in mixes])
    return body + "\n\n" + md_table(
        ["SSM state dim", "vLLM+", "SGLang+", "Marconi (tuned α)", "vs vLLM+", "vs SGLang+", "paper vs vLLM+"],
        [[d["dim"], fmt_pct(d["hit"]["vllm+"]), fmt_pct(d["hit"]["sglang+"]),
          f"{fmt_pct(d['hit']['marconi'])} ({fmt_alphas(d['tuned_alpha'])})", fmt_times(d["vs_vllm_x"]),
          fmt_times(d["vs_sglang_x"]), fmt_times(PAPER["fig12b_vllm"].get(d["dim"]))] for d in dims])


def verdict(records: FigureRecords) -> list[Finding]:
    mixes: list[dict[str, Any]] = records.data.get("mixes", [])
    dims: list[dict[str, Any]] = records.data.get("state_dims", [])
    findings = []
    hybrid = sorted((m for m in mixes if m["ssm"]), key=lambda m: m["ssm"] / max(m["attn"], 1))
    if hybrid:
        grows_v = all(a["vs_vllm_x"] <= b["vs_vllm_x"] for a, b in zip(hybrid, hybrid[1:]))
        grows_s = all(a["vs_sglang"] <= b["vs_sglang"] for a, b in zip(hybrid, hybrid[1:]))
        grows = grows_v and grows_s
        pure = next((m for m in mixes if not m["ssm"]), None)
        equal = pure is not None and pure["spread"] < 0.05
        findings.append(Finding(
            "Fig. 12a", "more SSM layers → larger gain; pure transformer → all systems equal",
            "vs vLLM+ 1.14× → 1.67× → 2.6×; vs SGLang+ +5.8% → +26.0% → +59.7%; equal at 0:36",
            "vs vLLM+ " + " → ".join(fmt_times(m["vs_vllm_x"]) for m in hybrid) + "; vs SGLang+ "
            + " → ".join(fmt_signed_pct(m["vs_sglang"]) for m in hybrid)
            + (f"; transformer spread {fmt_pct(pure['spread'])}" if pure else ""),
            "yes" if grows and equal else "partly" if grows_v or grows_s or equal else "no"))
    if len(dims) >= 2:
        grows = all(a["vs_vllm_x"] <= b["vs_vllm_x"] for a, b in zip(dims, dims[1:]))
        findings.append(Finding(
            "Fig. 12b", "larger SSM state → larger gain over vLLM+",
            "5.7× (N=16) → 35.4× (N=128)", " → ".join(f"{fmt_times(d['vs_vllm_x'])} (N={d['dim']})" for d in dims),
            "yes" if grows and dims[-1]["vs_vllm_x"] > dims[0]["vs_vllm_x"] else
            "partly" if dims[-1]["vs_vllm_x"] > dims[0]["vs_vllm_x"] else "no"))
    return findings


def explain(records: FigureRecords, computed: Mapping[str, FigureRecords]) -> str:
    mixes, dims = records.data.get("mixes", []), records.data.get("state_dims", [])
    if not mixes and not dims:
        return ""
    text = ("The gain over vLLM+ grows with the SSM share and the state size for the paper's reason — vLLM+ stores a "
            "full SSM checkpoint per 32-token block, so its waste scales with the state bytes. Absolute multiples are not "
            "comparable: the paper's own fig. 12a and 12b disagree by an order of magnitude for nearly the same model "
            "(2.6× at 1:8 vs 35.4× at N=128) because each is normalized differently, and we size every model's cache as "
            "the same fraction of its own working set (constant contention)")
    eight = next((m for m in mixes if m["mix"] == "1:8"), None)
    if eight and dims:
        text += f"; ours are {fmt_times(eight['vs_vllm_x'])} at 1:8 and {fmt_times(dims[-1]['vs_vllm_x'])} at " \
                f"N={dims[-1]['dim']}"
    neg = [m for m in mixes if m["ssm"] and m["vs_sglang"] < 0]
    if neg:
        text += (f". The gain over SGLang+ is negative for {', '.join(m['mix'] for m in neg)}: it follows the α each "
                 "run's window picked (listed in the table) as in fig. 8 more than the layer mix")
    pure = next((m for m in mixes if not m["ssm"]), None)
    if pure:
        text += (f"; for the pure transformer the three systems agree within {fmt_pct(pure['spread'])} (vLLM+ differs "
                 "only by 32-token block matching)")
    return text + "."
