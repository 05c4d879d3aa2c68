"""Relative gains and plots from sweep records (``marconi compare results.jsonl``).

Per (trace, model, capacity, mode, latency model, request set) group, each system against the
paper's baselines: token hit rate as a ratio to vLLM+ and a percentage gain over SGLang+, P95 TTFT
relative to vanilla, and, where present, hit rate as a fraction of ``oracle`` and ``infinite``.
Records of the same point given twice (two runs' files concatenated) each get a row
(:func:`repeated_points`).

A record's request set is what it carries of the requests it replayed: ``num_requests``,
``input_tokens`` and ``working_set_bytes`` (what a fractional capacity such as ``0.1x`` was made
of). Records of one trace label but different sets (``simulate --limit 20`` beside the whole
trace, or a trace file rebuilt under the same name) are never compared with each other: they are
split into separate groups, each row's trace labelled with its set (``swe-sample (20 requests)``),
and a NOTE says so. Split rather than refused: each set's comparison is sound on its own, a
researcher who concatenated two runs' files still sees both, and a baseline that only one set holds
shows as missing (``–``) in the other instead of as a wrong gain.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from marconi.units import format_bytes

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


# What a record carries of the requests it replayed, in the order a label names them.
_REQUEST_SET = ("num_requests", "input_tokens", "working_set_bytes")


def _request_set(rec: dict[str, Any]) -> tuple:
    return tuple(rec.get(name) for name in _REQUEST_SET)


def _family(rec: dict[str, Any]) -> tuple:
    """(trace, model, mode, latency): what a trace label's rows share, whatever their capacity."""
    return (rec.get("trace"), rec.get("model"), rec.get("mode"), rec.get("latency"))


def _group_key(rec: dict[str, Any]) -> tuple:
    """The point a record is of: by the capacity asked for (its label), not the bytes a system made of
    it: ``vllm-align`` and ``sglang-unified`` round a capacity to whole blocks or slots, and are
    compared with the systems given the same capacity; and by its request set (see the module)."""
    return (rec.get("trace"), rec.get("model"), _capacity_of(rec), rec.get("mode"), rec.get("latency"),
            *_request_set(rec))


def repeated_points(records: Sequence[dict[str, Any]]) -> int:
    """How many records repeat an earlier record's point (its group, request set included, and system)."""
    keys = [(*_group_key(r), r.get("system")) for r in records]
    return len(keys) - len(set(keys))


def _distinguishing(sets: set[tuple]) -> list[int]:
    """The indices into :data:`_REQUEST_SET` a label needs to tell ``sets`` apart: a field where two
    sets agree on every earlier field but differ on it (an absent working set, that of a capacity in
    bytes, tells nothing apart)."""
    fields = []
    for i in range(len(_REQUEST_SET)):
        seen: dict[tuple, set[Any]] = defaultdict(set)
        for each in sets:
            if each[i] is not None or i < 2:
                seen[each[:i]].add(each[i])
        if any(len(values) > 1 for values in seen.values()):
            fields.append(i)
    return fields


def _count(value: Any) -> str:
    return f"{value:,}" if type(value) is int else str(value)


def _set_labels(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per record, ``(text, tag)`` naming its request set where its (trace, model, mode, latency) holds
    records of several (``"20 requests"``, ``"20req"`` for a file name), else ``("", "")``."""
    families: dict[tuple, set[tuple]] = defaultdict(set)
    for rec in records:
        families[_family(rec)].add(_request_set(rec))
    fields = {family: _distinguishing(sets) for family, sets in families.items()}
    out = []
    for rec in records:
        values = _request_set(rec)
        text, tag = [], []
        for i in fields[_family(rec)]:
            value = values[i]
            if i == 0:
                text.append(f"{_count(value)} requests" if value is not None else "requests not recorded")
                tag.append(f"{value}req")
            elif i == 1:
                text.append(f"{_count(value)} input tokens" if value is not None else "input tokens not recorded")
                tag.append(f"{value}tok")
            elif value is not None:
                text.append("working set " + (format_bytes(value) if type(value) in (int, float) else str(value)))
                tag.append(f"ws{value}")
        out.append((", ".join(text), "_".join(tag)))
    return out


def _note_request_sets(records: Sequence[dict[str, Any]], labels: Sequence[tuple[str, str]],
                       notice: Callable[[str], None]) -> None:
    """Tell ``notice``, once per (trace, model, mode, latency) whose records come from several request
    sets, which sets, and which capacities' groups were split between them."""
    sets: dict[tuple, dict[str, None]] = defaultdict(dict)
    split: dict[tuple, dict[Any, set[tuple]]] = defaultdict(lambda: defaultdict(set))
    for rec, (text, _) in zip(records, labels):
        if text:
            sets[_family(rec)][text] = None
            split[_family(rec)][_capacity_of(rec)].add(_request_set(rec))
    for family, texts in sets.items():
        trace, model, mode, latency = family
        where = ", ".join(str(v) for v in (model, mode, latency) if v is not None)
        caps = [str(cap) for cap, held in split[family].items() if len(held) > 1]
        notice(f"the records of trace {trace} ({where}) come from {len(texts)} different request sets "
               f"({'; '.join(texts)}): systems are compared within one set only, and each row's trace names "
               "its set" + (f"; the group{'s' * (len(caps) > 1)} at capacity {', '.join(caps)} held several sets "
                             f"and {'were' if len(caps) > 1 else 'was'} split" if caps else ""))


def _print_note(message: str) -> None:
    print(f"NOTE: {message}", file=sys.stderr)


def _with_infinite_everywhere(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One capacity-independent ``infinite`` record serves every capacity of its (trace, model, mode,
    latency) and request set that lacks one (a working set only one of them records does not count)."""
    out = list(records)
    have = {_group_key(r) for r in records if base_name(r["system"]) == "infinite"}
    ceilings: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if base_name(r["system"]) == "infinite":
            ceilings[(*_family(r), *_request_set(r)[:2])].append(r)
    for key in dict.fromkeys(_group_key(r) for r in records):
        trace, model, cap, mode, latency, requests, tokens, working_set = key
        inf = next((r for r in ceilings.get((trace, model, mode, latency, requests, tokens), ())
                    if None in (r.get("working_set_bytes"), working_set)
                    or r.get("working_set_bytes") == working_set), None)
        if inf is not None and key not in have:
            out.append({**inf, "capacity": cap, "working_set_bytes": working_set, "_shared": True})
    return out


def gains(records: Sequence[dict[str, Any]], *,
          notice: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (group, system): hit rate, and gains vs vLLM+ (x), SGLang+ (%), vanilla TTFT.

    Records of one trace label but different request sets are compared apart (see the module): their
    rows' ``trace`` reads ``"swe-sample (20 requests)"``, and ``notice`` (None: a ``NOTE:`` line on
    stderr) is told once per trace, model, mode and latency model whose records hold several sets.
    Nothing is raised for it; the records are not changed.
    """
    expanded = _with_infinite_everywhere(records)
    labels = _set_labels(expanded)
    _note_request_sets(records, labels[:len(records)], notice or _print_note)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    label_of: dict[tuple, str] = {}
    for rec, (text, _) in zip(expanded, labels):
        groups[_group_key(rec)].append(rec)
        label_of[_group_key(rec)] = text
    rows = []
    for key, recs in groups.items():
        by_base = {base_name(r["system"]): r for r in recs}
        vllm, sglang, vanilla = by_base.get("vllm+"), by_base.get("sglang+"), by_base.get("vanilla")
        ceilings = {name: by_base[name]["token_hit_rate"] for name in ("oracle", "infinite") if name in by_base}
        for r in recs:
            if r.get("_shared"):
                continue
            hit = r["token_hit_rate"]
            trace = f"{key[0]} ({label_of[key]})" if label_of[key] else key[0]
            row = {"trace": trace, "model": key[1], "capacity": r.get("capacity", key[2]), "mode": key[3],
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
    """Hit-rate bars per group, per-request hit-rate box plots and TTFT CDFs. Returns PNG paths.

    Records of one trace label but different request sets (see the module) get plots of their own,
    titled with the set and named with a tag of it (``swe-sample_20req_paper-7b_sequential_hit_rate.png``).
    """
    from marconi.report import pyplot, save_figure

    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for rec, (text, tag) in zip(records, _set_labels(records)):
        groups[(rec.get("trace"), text, tag, rec.get("model"), rec.get("mode"))].append(rec)
    paths = []
    for (trace, set_text, set_tag, model, mode), recs in groups.items():
        tagged = f"{Path(str(trace)).stem}_{set_tag}" if set_tag else Path(str(trace)).stem
        stem = plot_text(f"{tagged}_{model}_{mode}").replace("/", "_")
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
        ax.set_title(plot_text(f"{Path(str(trace)).name}{f' ({set_text})' if set_text else ''} — {model}"))
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
