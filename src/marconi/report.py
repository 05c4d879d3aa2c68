"""Presentation helpers, in one place: number formatters, Markdown and plain-text tables, figures.

Every report formats its numbers here, so a quantity reads the same everywhere; ``None``, NaN and
infinities print as :data:`MISSING` (an en dash). No computation lives here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["MISSING", "fmt_pct", "fmt_signed_pct", "fmt_pts", "fmt_times", "fmt_seconds", "md_table",
           "format_table", "pyplot", "save_figure", "drop_stale_plots", "plot_ttft_cdf"]

MISSING = "–"
"""What every formatter and table prints for a missing value (None, NaN or infinite)."""


def _missing(x: float | None) -> bool:
    return x is None or not math.isfinite(x)


def fmt_pct(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.1234 -> "12.3%"``."""
    return MISSING if _missing(x) else f"{100 * x:.{digits}f}%"  # type: ignore[operator]


def fmt_signed_pct(x: float | None, digits: int = 1) -> str:
    """A relative change as a signed percentage: ``-0.05 -> "-5.0%"``, ``0.2 -> "+20.0%"``."""
    return MISSING if _missing(x) else f"{100 * x:+.{digits}f}%"  # type: ignore[operator]


def fmt_pts(x: float | None) -> str:
    """A difference of two fractions in percentage points: ``0.0123 -> "+1.23 pts"``."""
    return MISSING if _missing(x) else f"{100 * x:+.2f} pts"  # type: ignore[operator]


def fmt_times(x: float | None) -> str:
    """A multiple: ``4.5 -> "4.50×"``."""
    return MISSING if _missing(x) else f"{x:.2f}×"


def fmt_seconds(x: float | None) -> str:
    """A duration: milliseconds below 1 s (``0.0123 -> "12.3ms"``), else seconds (``9.1014 -> "9.10s"``,
    ``12.0 -> "12.0s"``): a column of TTFTs reads in one unit once they pass a second."""
    if _missing(x):
        return MISSING
    assert x is not None
    return f"{x * 1000:.1f}ms" if x < 1 else (f"{x:.2f}s" if x < 10 else f"{x:.1f}s")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells are ``str()``-ed as they are (format them first)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


Column = tuple[str, str, "Callable[[Any], str] | None"]


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Aligned plain text, one line per record; ``columns`` are ``(header, key, formatter)``; a missing
    or None value prints :data:`MISSING`; the first column left-aligned, the rest right-aligned."""
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        line = []
        for _, key, fmt in columns:
            value = row.get(key)
            line.append(MISSING if value is None else (fmt(value) if fmt else str(value)))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported on first use: it is slow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 110) -> Path:
    """Save ``fig`` as a PNG at ``path`` atomically (``path`` unchanged on error) and close it either
    way; returns ``path``."""
    from marconi.io import atomic_write

    plt = pyplot()
    target = Path(path)
    try:
        with atomic_write(target, "wb") as fh:
            fig.savefig(fh, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return target


def drop_stale_plots(folder: str | os.PathLike[str], patterns: Sequence[str], written: Iterable[Path]) -> list[Path]:
    """Remove the plots an earlier run of this report wrote into ``folder`` that this run did not write
    (its other capacities or traces, which no record of this one supports), then note this run's.
    What a run writes is noted in ``folder/.marconi-plots``; only files named there, and named as this
    report names its plots (``patterns``, globs), are removed, so a file someone else put in the folder
    is never touched (a folder without the note loses nothing). Returns what was removed."""
    from marconi.io import atomic_write

    root = Path(folder)
    note = root / PLOTS_NOTE
    keep = {Path(p).resolve() for p in written}
    try:
        ours = {line.strip() for line in note.read_text(encoding="utf-8").splitlines() if line.strip()}
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        ours = set()
    stale = sorted({p for pattern in patterns for p in root.glob(pattern)
                    if p.is_file() and p.name in ours and p.resolve() not in keep})
    for path in stale:
        path.unlink()
    names = sorted(p.name for p in keep if p.parent == root.resolve())
    with atomic_write(note, "w") as fh:
        fh.write("".join(f"{name}\n" for name in names))
    return stale


#: The file in a plots folder that names the plots a report wrote there (:func:`drop_stale_plots`).
PLOTS_NOTE = ".marconi-plots"


def plot_ttft_cdf(records: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, clock: str, title: str) -> Path:
    """One CDF of per-request TTFT per record (PNG, atomic); returns ``path``. Records need
    ``per_request.ttft_s``, ``token_hit_rate`` and ``arm`` (or ``policy``); ``clock`` labels the x axis."""
    import numpy as np

    fig, ax = pyplot().subplots(figsize=(6, 4))
    for rec in records:
        ttft = np.sort(np.asarray(rec["per_request"]["ttft_s"], dtype=np.float64)) * 1000
        ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post",
                label=f"{rec.get('arm', rec.get('policy'))} (hit {100 * rec['token_hit_rate']:.1f}%)")
    ax.set_xscale("log")
    ax.set_xlabel(f"TTFT (ms, {clock})")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)
