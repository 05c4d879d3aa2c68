"""What every experiment's ``--from-records`` re-render shares: read and check the old records first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

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


def render_records(from_records: str | Path, out: str | Path, *, required: Sequence[str], kind: str,
                   write: Callable[[list[dict[str, Any]], bool, Path], Sequence[Path]]) -> str:
    """Re-render ``out`` from an earlier run's records: :func:`records_to_render`, a rehearsal into a
    scratch folder, then ``write(records, write_records, folder)`` (``write_records`` false when the
    records are ``out``'s own); returns the line a command prints. ConfigError, ``out`` unchanged,
    where the records cannot be rendered."""
    records, same = records_to_render(from_records, out, required=required, kind=kind)
    _rehearse(records, from_records, out, kind, write)
    paths = write(records, not same, Path(out))
    return f"rendered {len(records)} records from {from_records} into {len(paths)} files under {out}"


def _rehearse(records: list[dict[str, Any]], from_records: str | Path, out: str | Path, kind: str,
              write: Callable[[list[dict[str, Any]], bool, Path], Sequence[Path]]) -> None:
    """Render once into a scratch folder (then removed), so that records the report cannot read (a
    field it reads missing or of another type: the check above knows only the fields every record
    has) fail before anything in ``out`` changes. ConfigError naming the file."""
    from marconi.pool import scratch_dir

    try:
        with scratch_dir("marconi-render-") as scratch:
            write(records, True, scratch / Path(out).name)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        what = f"field {exc.args[0]!r} missing" if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{from_records}: these records cannot be rendered as {kind} ({type(exc).__name__}: "
                          f"{what}); a field the report reads is missing or of another type. Nothing under "
                          f"{out} was changed") from None
