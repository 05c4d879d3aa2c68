"""What every experiment's ``--from-records`` re-render shares: read and check the old records first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from marconi.core.registry import ConfigError


def records_to_render(from_records: str | Path, out: str | Path, *, required: Sequence[str],
                      kind: str) -> tuple[list[dict[str, Any]], bool]:
    """The records of an earlier run, every one checked before anything is written to ``out`` (a
    wrong file must not be copied there), and whether ``from_records`` is ``out``'s own
    ``records.jsonl`` (then the caller must not rewrite it while reading it).

    Raises:
        ConfigError: a record lacks a field of ``required`` (naming the file and line), or there are none.
    """
    from marconi.sim.sweep import read_records

    records = read_records(from_records, required=required, kind=kind)
    if not records:
        raise ConfigError(f"{from_records}: no records to render")
    same = Path(from_records).resolve() == (Path(out) / "records.jsonl").resolve()
    return records, same
