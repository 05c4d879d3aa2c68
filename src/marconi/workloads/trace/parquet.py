"""Parquet traces: rows read one Arrow batch at a time, row groups of about 4M tokens written;
registers ``parquet``. Columns as the JSONL fields; ``name`` and ``meta`` in the schema metadata
under ``marconi.trace``. PyArrow is imported only when a file is read or written."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .formats import TraceFormat, register_format
from .schema import INT32_MAX, Record, Request, TraceFormatError, TraceProblem, check_record

__all__ = ["parquet_records", "write_parquet", "read_parquet_meta", "PARQUET"]

PARQUET_META_KEY = b"marconi.trace"
_ROW_GROUP_TOKENS = 1024 * 1024  # tokens per Parquet row group (4 MiB of int32): bounds reader memory
_ROW_GROUP_ROWS = 4096




def _pa():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def _is_int_list_type(pa: Any, typ: Any) -> bool:
    return (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and pa.types.is_integer(typ.value_type)


def _token_column(col: Any, row0: int) -> tuple[list[np.ndarray] | None, list[tuple[int, str]]]:
    """Split a list<int> Arrow column into per-row int32 arrays; problems as (row, message)."""
    problems: list[tuple[int, str]] = []
    if col.null_count:
        for i in np.flatnonzero(np.asarray(col.is_null())):
            problems.append((row0 + int(i), "null"))
    flat = col.flatten()
    offsets = np.asarray(col.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    if flat.null_count:  # a null id inside a list: the row (not its batch's first) and the element
        nulls = np.flatnonzero(np.asarray(flat.is_null()))
        rows = np.searchsorted(offsets, nulls, side="right") - 1
        named: set[int] = set()
        for flat_i, r in zip(nulls.tolist(), rows.tolist()):
            if r not in named:
                named.add(r)
                problems.append((row0 + r, f"element {flat_i - int(offsets[r])} is null (token ids are integers)"))
        flat = flat.fill_null(0)  # those rows are reported; the others read as they are
    values = flat.to_numpy(zero_copy_only=False)
    if values.size:
        bad = np.flatnonzero((values < 0) | (values > INT32_MAX))
        if bad.size:
            rows = np.searchsorted(offsets, bad, side="right") - 1
            seen: set[int] = set()
            for flat_i, r in zip(bad.tolist(), rows.tolist()):
                if r in seen:
                    continue
                seen.add(r)
                v = int(values[flat_i])
                what = "is negative" if v < 0 else f"does not fit int32 (max {INT32_MAX})"
                problems.append((row0 + r, f"element {flat_i - int(offsets[r])} ({v}) {what}"))
    values = np.array(values, dtype=np.int32)  # own the memory: Arrow batch buffers are freed
    arrays = [values[offsets[i]:offsets[i + 1]] for i in range(len(col))]
    return arrays, problems


def parquet_records(path: Path, batch_rows: int = 128) -> Iterator[Record]:
    """Yield (0-based row, fields, problems) for each row, one Arrow batch in memory at a time."""
    _, pq = _pa()
    try:
        pf = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering reads far ahead: memory
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError variants
        yield 0, {}, [(None, f"not a readable Parquet file ({exc})")]
        return
    names = set(pf.schema_arrow.names)
    missing = [c for c in ("session_id", "turn_id", "ts", "input_tokens", "output_tokens") if c not in names]
    if missing:
        yield 0, {}, [(c, "missing column") for c in missing]
        return
    pa, _ = _pa()
    bad_types = [(c, f"expected a list<int> column, got {pf.schema_arrow.field(c).type}")
                 for c in ("input_tokens", "output_tokens")
                 if not _is_int_list_type(pa, pf.schema_arrow.field(c).type)]
    if bad_types:
        yield 0, {}, bad_types
        return
    columns = [c for c in ("session_id", "turn_id", "ts", "input_tokens", "output_tokens",
                           "num_input_tokens", "num_output_tokens") if c in names]
    row0 = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        n = batch.num_rows
        row_problems: dict[int, list[tuple[str | None, str]]] = {}
        token_arrays: dict[str, list[np.ndarray] | None] = {}
        for name in ("input_tokens", "output_tokens"):
            arrays, probs = _token_column(batch.column(name), row0)
            token_arrays[name] = arrays
            for r, msg in probs:
                row_problems.setdefault(r, []).append((name, msg))
        scalars = {c: batch.column(c).to_pylist() for c in columns
                   if c not in ("input_tokens", "output_tokens")}
        for i in range(n):
            obj = {c: values[i] for c, values in scalars.items()}
            for c in ("num_input_tokens", "num_output_tokens"):
                if c in obj and obj[c] is None:
                    del obj[c]  # a null count in an optional column means "not given"
            reported = row_problems.get(row0 + i, [])
            skip = {f for f, _ in reported}
            tokens = {name: arrays[i] for name, arrays in token_arrays.items()
                      if arrays is not None and name not in skip}
            fields, problems = check_record(obj, tokens, skip=skip | set(token_arrays))
            yield row0 + i, fields, reported + problems
        row0 += n


def _parquet_table(batch: Sequence[Request], sid_type: Any, schema: Any) -> Any:
    pa, _ = _pa()

    def tokens(attr: str) -> Any:
        arrays = [getattr(r, attr) for r in batch]
        lens = np.fromiter((a.size for a in arrays), dtype=np.int32, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))

    sids = [r.session_id for r in batch]
    for s in sids:
        if not isinstance(s, int if sid_type == pa.int64() else str):
            raise ValueError("Parquet traces need all session ids of one type (all int or all str); "
                             f"got {type(s).__name__} after {'int' if sid_type == pa.int64() else 'str'}")
    return pa.Table.from_arrays(
        [pa.array(sids, type=sid_type),
         pa.array([r.turn_id for r in batch], type=pa.int64()),
         pa.array(np.fromiter((r.ts for r in batch), dtype=np.float64, count=len(batch))),
         tokens("input_tokens"),
         tokens("output_tokens")],
        schema=schema,
    )


def write_parquet(fh: io.IOBase, requests: Iterable[Request], name: str, meta: Mapping[str, Any]) -> int:
    """Write ``requests`` to the binary ``fh`` as zstd Parquet (``name``/``meta`` in the schema metadata,
    one row group buffered at a time); returns the count."""
    pa, pq = _pa()
    writer = None
    batch: list[Request] = []
    batch_tokens = 0
    n = 0
    sid_type = schema = None

    def flush() -> None:
        nonlocal writer
        table = _parquet_table(batch, sid_type, schema)
        if writer is None:
            writer = pq.ParquetWriter(fh, schema, compression="zstd")
        writer.write_table(table, row_group_size=len(batch))

    try:
        for req in requests:
            if schema is None:
                sid_type = pa.int64() if isinstance(req.session_id, int) else pa.string()
                schema = _parquet_schema(sid_type, name, meta)
            batch.append(req)
            batch_tokens += req.input_len + req.output_len
            n += 1
            if batch_tokens >= _ROW_GROUP_TOKENS or len(batch) >= _ROW_GROUP_ROWS:
                flush()
                batch, batch_tokens = [], 0
        if schema is None:  # an empty trace still gets a valid file with the schema
            sid_type = pa.int64()
            schema = _parquet_schema(sid_type, name, meta)
        if batch or writer is None:
            flush()
    finally:
        if writer is not None:
            writer.close()
    return n


def _parquet_schema(sid_type: Any, name: str, meta: Mapping[str, Any]) -> Any:
    pa, _ = _pa()
    return pa.schema(
        [("session_id", sid_type), ("turn_id", pa.int64()), ("ts", pa.float64()),
         ("input_tokens", pa.list_(pa.int32())), ("output_tokens", pa.list_(pa.int32()))],
        metadata={PARQUET_META_KEY: json.dumps({"name": name, "meta": meta}, default=str).encode()},
    )


def read_parquet_meta(path: Path) -> Any:
    """The stored ``{"name", "meta"}``, unchecked; ``{}`` when none or unreadable (reading says why).

    Raises:
        TraceFormatError: not UTF-8 JSON (naming file and key).
    """
    _, pq = _pa()
    try:
        md = pq.read_schema(path).metadata or {}
    except Exception:  # pyarrow raises ArrowInvalid / OSError variants
        md = {}
    if PARQUET_META_KEY not in md:
        return {}
    try:
        return json.loads(md[PARQUET_META_KEY])
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TraceFormatError(TraceProblem(
            str(path), None, None, None,
            f"schema metadata {PARQUET_META_KEY.decode()!r} is not valid JSON ({exc}); rewrite the file with "
            "write_trace, or drop that key")) from None


PARQUET = register_format(TraceFormat("parquet", (".parquet",), parquet_records, write_parquet, read_parquet_meta,
                                      position="row"))
