"""Relative gains and plots from sweep records (``marconi compare results.jsonl``).

Per (trace, model, capacity, mode, latency model) group, each system against the paper's
baselines: token hit rate as a ratio to vLLM+ and a percentage gain over SGLang+, P95 TTFT relative
to vanilla, and, where present, hit rate as a fraction of ``oracle`` and ``infinite``. Records of
the same point given twice (two runs' files concatenated) each get a row (:func:`repeated_points`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["gains", "plot_records", "base_name", "plot_text", "repeated_points"]


def plot_text(value: Any) -> str:
    """``value`` as valid UTF-8 for plots and file names (matplotlib refuses lone surrogates): an
    undecodable byte becomes U+FFFD, any other lone surrogate ``?``."""
    text = str(value)
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def base_name(label: str) -> str:
    """``marconi:alpha=1`` -> ``marconi``."""
    return label.split(":", 1)[0]


def _group_key(rec: dict[str, Any]) -> tuple:
    """The point a record is of: by the capacity asked for (its label), not the bytes a system made of
    it: ``vllm-align`` and ``sglang-unified`` round a capacity to whole blocks or slots, and are
    compared with the systems given the same capacity."""
    return (rec.get("trace"), rec.get("model"), _capacity_of(rec), rec.get("mode"), rec.get("latency"))


def repeated_points(records: Sequence[dict[str, Any]]) -> int:
    """How many records repeat an earlier record's point (its group and system)."""
    keys = [(*_group_key(r), r.get("system")) for r in records]
    return len(keys) - len(set(keys))


def _with_infinite_everywhere(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One capacity-independent ``infinite`` record serves every capacity of its (trace, model, mode,
    latency) that lacks one."""
    out = list(records)
    have = {_group_key(r) for r in records if base_name(r["system"]) == "infinite"}
    ceilings = {(r.get("trace"), r.get("model"), r.get("mode"), r.get("latency")): r for r in records
                if base_name(r["system"]) == "infinite"}
    for key in dict.fromkeys(_group_key(r) for r in records):
        inf = ceilings.get((key[0], key[1], key[3], key[4]))
        if inf is not None and key not in have:
            out.append({**inf, "capacity": key[2], "_shared": True})
    return out


def gains(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (group, system): hit rate, and gains vs vLLM+ (x), SGLang+ (%), vanilla TTFT."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for rec in _with_infinite_everywhere(records):
        groups[_group_key(rec)].append(rec)
    rows = []
    for key, recs in groups.items():
        by_base = {base_name(r["system"]): r for r in recs}
        vllm, sglang, vanilla = by_base.get("vllm+"), by_base.get("sglang+"), by_base.get("vanilla")
        ceilings = {name: by_base[name]["token_hit_rate"] for name in ("oracle", "infinite") if name in by_base}
        for r in recs:
            if r.get("_shared"):
                continue
            hit = r["token_hit_rate"]
            row = {"trace": key[0], "model": key[1], "capacity": r.get("capacity", key[2]), "mode": key[3],
                   "latency": key[4], "system": r["system"],
                   "token_hit_rate": hit, "hit_rate_p95": r.get("hit_rate_p95"), "flops_saved_fraction":
                   r.get("flops_saved_fraction"), "ttft_p95_s": r.get("ttft_p95_s")}
            if vllm is not None and vllm["token_hit_rate"] > 0:
                row["vs_vllm_x"] = hit / vllm["token_hit_rate"]
            if sglang is not None and sglang["token_hit_rate"] > 0:
                row["vs_sglang_pct"] = hit / sglang["token_hit_rate"] - 1
            for name, ceiling in ceilings.items():
                if ceiling > 0:
                    row[f"of_{name}"] = hit / ceiling
            base_ttft = r.get("vanilla_ttft_p95_s") or (vanilla or {}).get("ttft_p95_s")
            if base_ttft and r.get("ttft_p95_s") is not None:
                row["p95_ttft_vs_vanilla"] = r["ttft_p95_s"] / base_ttft - 1
            rows.append(row)
    return rows


def _capacity_of(rec: dict[str, Any]) -> Any:
    """A record's ``capacity`` (its label, ``0.1x``) where it has one, else its bytes (None: neither)."""
    return rec["capacity"] if "capacity" in rec else rec.get("capacity_bytes")


def plot_records(records: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Hit-rate bars per group, per-request hit-rate box plots and TTFT CDFs. Returns PNG paths."""
    from marconi.report import pyplot, save_figure

    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        groups[(rec.get("trace"), rec.get("model"), rec.get("mode"))].append(rec)
    paths = []
    for (trace, model, mode), recs in groups.items():
        stem = plot_text(f"{Path(str(trace)).stem}_{model}_{mode}").replace("/", "_")
        systems = list(dict.fromkeys(r["system"] for r in recs))
        caps = list(dict.fromkeys(_capacity_of(r) for r in recs))
        fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(caps) * len(systems) / 3, 3.6))
        width = 0.8 / max(1, len(systems))
        for j, system in enumerate(systems):
            vals = [next((r["token_hit_rate"] for r in recs if r["system"] == system
                          and _capacity_of(r) == c), 0.0) for c in caps]
            ax.bar(np.arange(len(caps)) + j * width, np.array(vals) * 100, width, label=plot_text(system))
        ax.set_xticks(np.arange(len(caps)) + width * (len(systems) - 1) / 2, [plot_text(c) for c in caps])
        ax.set_xlabel("cache capacity")
        ax.set_ylabel("token hit rate (%)")
        ax.set_title(plot_text(f"{Path(str(trace)).name} — {model}"))
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(save_figure(fig, out_dir / f"{stem}_hit_rate.png", dpi=120))
        for cap in caps:
            per = [r for r in recs if _capacity_of(r) == cap and "per_request" in r]
            if not per:
                continue
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
            ax1.boxplot([np.array(r["per_request"]["hit_rate"]) * 100 for r in per], whis=(5, 95), showfliers=False)
            ax1.set_xticks(range(1, len(per) + 1), [plot_text(r["system"]) for r in per], rotation=20, fontsize=8)
            ax1.set_ylabel("per-request token hit rate (%)")
            ax1.set_title(plot_text(f"capacity {cap}: P5–P95 whiskers"))
            for r in per:
                ttft = np.sort(np.array(r["per_request"]["ttft_s"]))
                ax2.plot(ttft * 1000, np.linspace(0, 1, len(ttft)), label=plot_text(r["system"]))
            ax2.set_xlabel("modelled TTFT (ms)")
            ax2.set_ylabel("CDF")
            ax2.set_xscale("symlog")
            ax2.legend(fontsize=8)
            fig.tight_layout()
            paths.append(save_figure(fig, out_dir / f"{stem}_{plot_text(cap).replace('/', '_')}_requests.png",
                                     dpi=120))
    return paths
