"""Parquet: encoding one committed shard, and opening input files.

Encoding: Parquet bytes with row groups bounded by decoded size. A reader
decodes whole row groups (or streams one in pieces), so a row group's decoded
size is the unit of read memory and of wasted decoding; bounding it by bytes,
not rows, keeps wide rows (long token sequences, images) from making gigabyte
row groups and narrow rows from making tiny ones.

Opening: every input Parquet file is opened by :func:`open_parquet`, which
reads INT96 timestamps (what Spark, Hive and Impala write) at
:data:`INT96_UNIT`. pyarrow's default, nanoseconds, ends in 2262, so a later
value (the warehouse sentinel 9999-12-31) would wrap to another date;
:func:`int96_lost` finds the values microseconds would change instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

#: The unit INT96 timestamps are read at: Spark's precision, whose range
#: (about 290,000 years) holds every INT96 date.
INT96_UNIT = "us"
#: The largest magnitude, in microseconds, that nanoseconds also hold.
_NS_RANGE_US = (2**63 - 1) // 1000

#: Default bound on a row group's decoded (Arrow, uncompressed) size.
ROW_GROUP_BYTES = 64 << 20
#: pyarrow's own cap on rows per row group.
MAX_ROW_GROUP_ROWS = 1 << 20


def encode_shard(
    table: pa.Table,
    *,
    compression: str = "snappy",
    row_group_size: int | None = None,
    row_group_bytes: int | None = None,
) -> tuple[bytes, list[int]]:
    """Parquet bytes of ``table`` and its row groups' row counts.

    Each row group holds at most ``row_group_size`` rows and at most
    ``row_group_bytes`` (default :data:`ROW_GROUP_BYTES`) of decoded Arrow data,
    measured on the rows themselves (so uneven rows are bounded too); a single
    row larger than the bound is a row group of its own. The rows are sized to
    7/8 of the bound: a reader allocates validity bitmaps the writer's arrays
    may not have (at most one bit per value of a byte-or-wider column).
    """
    import pyarrow.parquet as pq

    limit = int(row_group_bytes or ROW_GROUP_BYTES) * 7 // 8
    cap = min(int(row_group_size or MAX_ROW_GROUP_ROWS), MAX_ROW_GROUP_ROWS)
    n = table.num_rows
    sink = pa.BufferOutputStream()
    groups: list[int] = []
    with pq.ParquetWriter(sink, table.schema, compression=compression) as writer:
        i = 0
        per_row = table.nbytes / max(n, 1)
        while i < n:
            k = min(cap, n - i, max(1, int(limit // max(per_row, 1e-9))))
            part = table.slice(i, k)
            while k > 1 and part.nbytes > limit:
                # Rows here are larger than the average: shrink in proportion.
                k = max(1, min(k - 1, int(k * limit / part.nbytes)))
                part = table.slice(i, k)
            writer.write_table(part, row_group_size=k)
            groups.append(k)
            i += k
    buf = sink.getvalue()
    return buf.to_pybytes(), groups


def open_parquet(source: Any, **kwargs: Any) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` of an input file, INT96 at :data:`INT96_UNIT`."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, coerce_int96_timestamp_unit=INT96_UNIT, **kwargs)


def int96_columns(source: Any, pf: Any) -> list[str]:
    """The top-level columns of ``pf`` (opened by :func:`open_parquet` on
    ``source``) holding INT96 timestamps, at any depth: those whose type
    differs when the file is read at pyarrow's default unit."""

    if not any(pf.schema.column(i).physical_type == "INT96"
               for i in range(pf.metadata.num_columns)):
        return []
    default = open_parquet_ns(source, pf).schema_arrow
    return [f.name for f in pf.schema_arrow if not f.type.equals(default.field(f.name).type)]


def open_parquet_ns(source: Any, pf: Any) -> Any:
    """``source`` read at pyarrow's default INT96 unit (nanoseconds), for
    :func:`int96_lost` to compare with ``pf``."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, metadata=pf.metadata)


def _leaves(a: pa.Array) -> list[pa.Array]:
    """The timestamp arrays inside ``a`` (itself, or its lists' and structs' values)."""
    if isinstance(a, pa.ChunkedArray):
        return [leaf for chunk in a.chunks for leaf in _leaves(chunk)]
    t = a.type
    if pa.types.is_timestamp(t):
        return [a]
    if pa.types.is_struct(t):
        return [leaf for child in a.flatten() for leaf in _leaves(child)]
    if pa.types.is_map(t):
        return _leaves(a.keys) + _leaves(a.items)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaves(a.flatten())
    return []


def int96_lost(at_us: pa.Array, at_ns: pa.Array) -> int | None:
    """Where an INT96 column read at microseconds (``at_us``) drops what the
    nanosecond read of the same rows (``at_ns``) holds: the index of the first
    top-level row that differs (for a nested column, 0 where the first value
    inside it differs), or None when every value is exact.

    Values beyond the nanosecond range are not compared (their nanosecond read
    wrapped); within it, the nanosecond read is exact.
    """
    nested = not pa.types.is_timestamp(at_us.type)
    offset = 0
    for us, ns in zip(_leaves(at_us), _leaves(at_ns)):
        u = us.cast(pa.int64()).fill_null(0).to_numpy()
        n = ns.cast(pa.int64()).fill_null(0).to_numpy()
        within = np.abs(u) <= _NS_RANGE_US
        bad = np.flatnonzero(within & (n != u * 1000))
        if bad.size:
            return 0 if nested else offset + int(bad[0])
        offset += len(us)
    return None
