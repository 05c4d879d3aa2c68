"""Plain-text tables for the CLI (records in, aligned text out)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["format_table", "pct", "ratio", "fmt_s"]


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.1f}ms" if x < 10 else f"{x:.1f}s"


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, Callable[[Any], str] | None]]) -> str:
    """``columns`` = (header, key, formatter); missing keys print as '-'."""
    cells = [[h for h, _, _ in columns]]
    for row in rows:
        line = []
        for _, key, fmt in columns:
            value = row.get(key)
            line.append("-" if value is None else (fmt(value) if fmt else str(value)))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
